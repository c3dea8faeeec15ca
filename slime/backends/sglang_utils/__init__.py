"""Launch engine servers (real SGLang or the hf_engine), wait for health, update weights."""

from slime.backends.sglang_utils.launcher import (EngineLaunchError, EngineProcess, build_engine_command,
                                                  build_hf_engine_command, build_sglang_command, find_free_port,
                                                  launch_engine)
from slime.backends.sglang_utils.weights import (abort_all_requests, flush_cache, get_model_info,
                                                 update_weights_from_disk)

__all__ = ["EngineLaunchError", "EngineProcess", "build_engine_command", "build_hf_engine_command",
           "build_sglang_command", "find_free_port", "launch_engine", "abort_all_requests", "flush_cache",
           "get_model_info", "update_weights_from_disk"]
