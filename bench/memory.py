"""Peak memory of one call: CUDA's allocator peak, or the process's peak RSS on Linux."""
from __future__ import annotations

import gc
import re

import torch


def _proc_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(field_name + r":\s+(\d+)", f.read()).group(1))


def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def peak_memory_mb(fn, device: torch.device) -> tuple[float | None, str]:
    """Run fn once; return the peak memory above the level before it, in MiB, and how it was measured."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20, "cuda max_memory_allocated - allocated before"
    libc = _libc()
    try:
        gc.collect()
        if libc is not None:
            # glibc keeps freed heap pages, so a second run would not grow the RSS at all:
            # hand them back first, and serve large blocks with mmap so they come and go.
            libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (also stops its dynamic growth)
            libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
        base = _proc_kb("VmRSS")
        fn()
        return (_proc_kb("VmHWM") - base) / 1024, "peak RSS (VmHWM, reset, after malloc_trim) - RSS before"
    except (OSError, AttributeError):
        return None, "unavailable (needs Linux /proc/self/clear_refs)"
