"""Tasks and rewards: the built-in tasks, the reasoning-gym families (answer extraction, math-verify), tokenizers and prompts."""
