"""megatron-core trainer backend (optional extra `dynarl[megatron]`). Nothing here imports
megatron at module load: the modules that need it import it inside their functions."""
