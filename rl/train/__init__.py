"""The GRPO trainer and its loss: settings and presets, the step (rollout, learner, update), run folders, checkpoints, logging, evaluation, FSDP2."""
