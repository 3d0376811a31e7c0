"""SGLang rollout backend (optional extra dynarl[sglang]); imported lazily."""
