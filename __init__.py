"""dynarl: a Ray-free, asyncio-native runtime for RL post-training of LLMs."""
