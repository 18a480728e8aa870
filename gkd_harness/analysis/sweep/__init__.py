"""Loading a sweep into typed runs: run folders (:mod:`.runs`), the wandb API (:mod:`.wandb_api`) and wandb's
offline run files (:mod:`.offline`, :mod:`.wandb_file`), all into the tables of :mod:`.records`."""
