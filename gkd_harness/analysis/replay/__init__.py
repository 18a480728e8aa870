"""FP64 replay of loss inputs: the variants on one input (:mod:`.variants`) and ``gkd-replay`` (:mod:`.cli`)."""
