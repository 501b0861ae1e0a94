"""What a trace event is, by its category and name: the kinds of kernels, runtime calls and
copies, and the host ops of communication (see doctor.trace.events for the names recognised)."""

from __future__ import annotations

import re

from doctor.trace.typed_events import Args

# memcpy kinds and host memory kinds (codes kept in int arrays)
HTOD, DTOH, DTOD, OTHER_COPY = 0, 1, 2, 3
MEM_UNKNOWN, PAGEABLE, PINNED = 0, 1, 2
# runtime call kinds
RT_OTHER, RT_LAUNCH, RT_SYNC, RT_COPY = 0, 1, 2, 3
# kernel kinds
K_OTHER, K_COMM, K_GEMM, K_GEMM_TC, K_LAYOUT = 0, 1, 2, 3, 4

_COMM_KERNEL = re.compile(r"(?:^|[\s_:])(?:nccl|rccl)", re.IGNORECASE)
#: FSDP's own annotations and ops on the training thread, lowercased: FSDP2's ``FSDP::all_gather
#: (unit)``, ``FSDP::pre_backward (unit)``, ``fsdp::all_gather_copy_in``..., FSDP1's
#: ``FullyShardedDataParallel._pre_forward``... (its hooks: gathering, copying in and out,
#: reducing, resharding; never ``FullyShardedDataParallel.forward``, which holds the model's).
SHARDING_OP = ("fsdp::", "fullyshardeddataparallel._")
#: A functional collective's wait (DTensor's tensor parallel layers, compiled graphs): the thread
#: blocked on the collective it issued, as c10d's own ``wait`` is (its time is communication's,
#: not the op's around it: seen as 45 % of a tensor parallel job's step counted as compute).
FUNCTIONAL_WAIT = ("_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
#: Host ops of communication: the collectives (c10d's calls, the backends' work), DDP's
#: reducer's own work on the training thread (``torch::distributed::reducer::mul_out``: the
#: gradients' division by the world size), which a job without DDP does not do, and FSDP's
#: (SHARDING_OP): the training thread's time in them is communication's, as DDP's reducer's is.
COMM_OP = ("nccl:", "gloo:", "c10d::", "record_param_comms", "mpi:", "ucc:", "c10d:",
           "torch::distributed::reducer::", *SHARDING_OP, *FUNCTIONAL_WAIT)
_GEMM = re.compile(
    r"gemm|conv|cudnn|cublas|cutlass|xmma|wgrad|dgrad|fprop|winograd|matmul|mma", re.IGNORECASE
)
#: cuDNN's transposes between NCHW and NHWC around a convolution that runs NHWC (Tensor Cores)
#: on NCHW tensors: neither GEMM nor the model's own work.
_LAYOUT_KERNEL = re.compile(r"nchw_?to_?nhwc|nhwc_?to_?nchw|nchw2nhwc|nhwc2nchw", re.IGNORECASE)
#: cuDNN kernels that match _GEMM by their library's name but are batch normalisation.
_NOT_GEMM = re.compile(r"(?:^|[^a-z])bn_|batch_?norm", re.IGNORECASE)
_TENSOR_CORE = re.compile(
    r"884|1688|16816|hmma|xmma|wmma|gmma|tensorop|tf32|bf16|f16|fp16|half|_tc_|tensor_core",
    re.IGNORECASE,
)
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
    "cuCtxSynchronize", "cuEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
    "hipEventSynchronize",
    # synchronous copies block the host until the copy is done
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
    "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D",
})
HOST_CATS = frozenset({"cpu_op", "operator"})
GPU_ANNOTATION = "gpu_user_annotation"


def kernel_kind(name: str) -> int:
    if _COMM_KERNEL.search(name):
        return K_COMM
    if _LAYOUT_KERNEL.search(name):
        return K_LAYOUT
    if _GEMM.search(name) and not _NOT_GEMM.search(name):
        return K_GEMM_TC if _TENSOR_CORE.search(name) else K_GEMM
    return K_OTHER


def runtime_kind(name: str) -> int:
    if name in SYNC_CALLS:
        return RT_SYNC
    if "launch" in name.lower():
        return RT_LAUNCH
    if "memcpy" in name.lower():
        return RT_COPY
    return RT_OTHER


def copy_kind(name: str, args: Args) -> tuple[int, int]:
    low = name.lower()
    text = f"{low} {str(args.get('kind', '')).lower()}"
    if "htod" in text or "host -> device" in low:
        kind = HTOD
    elif "dtoh" in text:
        kind = DTOH
    elif "dtod" in text:
        kind = DTOD
    else:
        kind = OTHER_COPY
    mem = PAGEABLE if "pageable" in low else PINNED if "pinned" in low else MEM_UNKNOWN
    return kind, mem
