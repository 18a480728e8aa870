"""wandb dashboards as code: the standard workspace and sign-off report of a sweep (``gkd-dashboard``).

Modules, lowest first:

* :mod:`~gkd_harness.analysis.dashboard.names`: metric names and the harness config keys as wandb holds them;
* :mod:`~gkd_harness.analysis.dashboard.panels`: the standard panels as plain data, tolerance lines from the criteria;
* :mod:`~gkd_harness.analysis.dashboard.facts`: what the sweep logged (metric keys, config keys, tags, group, experiment);
* :mod:`~gkd_harness.analysis.dashboard.build`: wandb-workspaces objects, JSON specs, saving;
* :mod:`~gkd_harness.analysis.dashboard.cli`: the command.
"""
