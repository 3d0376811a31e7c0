"""Test-only stand-in for SGLang's CPU kernel package (`sgl_kernel`, a source build that
PyPI does not carry): only the names sglang 0.5.23 imports at import time on a CPU, each
raising when called. A name not listed here is an
ImportError, as without the package, so SGLang's own fallbacks still choose."""

NAMES = (  # every sgl_kernel name sglang 0.5.23 imports at module level on a CPU
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu", "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu", "copy_all_layer_kv_cache_cpu", "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu", "rotate_input_ids_cpu", "verify_tree_greedy_cpu",
)


def _stand_in(name):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: test stand-in (tests/sglang_cpu_site); the CPU kernel "
                                  "package is not installed")
    kernel.__name__ = name
    return kernel


for _name in NAMES:
    globals()[_name] = _stand_in(_name)
