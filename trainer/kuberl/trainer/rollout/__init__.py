"""Generation: the engine interface (:mod:`.base`), the engines (``hf``, ``vllm``) and their registry
(:mod:`.registry`), the separate engines seen from the driver, a pool that follows the rollout nodes (:mod:`.engine_pool`), the weight transfer into the
engines (:mod:`.weight_sync`), and multi-turn rollouts with tools (:mod:`.agent`, :mod:`.tools`)."""
