"""The sign-off: the criteria file (:mod:`.criteria_file`), criteria as functions of the loaded runs
(:mod:`.criteria`, with :mod:`.compare`, :mod:`.outcome`, :mod:`.betacurve`, :mod:`.certificates`,
:mod:`.seed_defect`), and the report (:mod:`.report`, :mod:`.document`, :mod:`.plots`, :mod:`.wandb_log`)."""
