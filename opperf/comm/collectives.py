"""The four collectives: what each moves, how bandwidth is counted, where its CSV goes, and one
(op, group, size) case with a known input pattern whose result is checked before any timing counts.

Message size convention (`message_bytes`, per rank, as the peer's HCCL files):
all_reduce — the buffer every rank reduces; all_gather — each rank's input (output is n times larger);
reduce_scatter — each rank's output (input is n times larger); all_to_all — each rank's whole send
buffer (n equal chunks, one per peer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opperf.comm.sizes import CommDtype
from opperf.errors import OpperfError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
BACKENDS = ("gloo", "nccl", "hccl")
# Where each back end's numbers come from, as the database directory names it.
BACKEND_OF_RUNTIME = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
RUNTIME_OF_BACKEND = {backend: runtime for runtime, backend in BACKEND_OF_RUNTIME.items()}


@dataclass(frozen=True)
class Collective:
    """One collective's bookkeeping: names, and the nccl-tests bandwidth conventions.

    algbw = nccl_bytes / time, where nccl_bytes is the size nccl-tests reports for the op;
    busbw = algbw * bus_factor(n), the per-link traffic a ring or tree needs, comparable across ops.
    """
    name: str
    hccl_kernel_type: str          # Type of its rows in torch_npu's kernel_details.csv
    nccl_bytes_per_message: Callable[[int], int]
    bus_factor: Callable[[int], float]

    def algbw_gbps(self, message_bytes: int, num_devices: int, duration_us: float) -> float:
        return self.nccl_bytes_per_message(num_devices) * message_bytes / (duration_us * 1e3)

    def busbw_gbps(self, message_bytes: int, num_devices: int, duration_us: float) -> float:
        return self.algbw_gbps(message_bytes, num_devices, duration_us) * self.bus_factor(num_devices)


COLLECTIVES: dict[str, Collective] = {
    "all_reduce": Collective("all_reduce", "hcom_allReduce_", lambda n: 1, lambda n: 2 * (n - 1) / n),
    "all_gather": Collective("all_gather", "hcom_allGather_", lambda n: n, lambda n: (n - 1) / n),
    "reduce_scatter": Collective("reduce_scatter", "hcom_reduceScatter_", lambda n: n, lambda n: (n - 1) / n),
    "all_to_all": Collective("all_to_all", "hcom_alltoallv_", lambda n: 1, lambda n: (n - 1) / n),
}


def collective(op: str) -> Collective:
    if op not in COLLECTIVES:
        raise OpperfError(f"unknown collective {op!r} (choose from {', '.join(OPS)})", field="--ops")
    return COLLECTIVES[op]


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise OpperfError(f"unknown communication back end {backend!r} (choose from {', '.join(BACKENDS)})",
                          field="--backend")
    return backend


# --- file names and version directories --------------------------------------------------------

def collective_file_name(backend: str, op: str) -> str:
    """The CSV file of `op`: the peer's `hcom_allReduce_.csv` names under hccl, `all_reduce.csv` elsewhere."""
    check_backend(backend)
    spec = collective(op)
    return f"{spec.hccl_kernel_type}.csv" if backend == "hccl" else f"{spec.name}.csv"


def op_of_file_name(backend: str, file_name: str) -> str:
    """The collective a CSV file name (or its stem) holds: inverse of `collective_file_name`."""
    name = file_name if file_name.endswith(".csv") else f"{file_name}.csv"
    for op in OPS:
        if collective_file_name(backend, op) == name:
            return op
    known = ", ".join(collective_file_name(backend, op) for op in OPS)
    raise OpperfError(f"{file_name!r} is not a {backend} collective file (known: {known})")


def comm_version_dir(backend: str) -> str:
    """The version directory of this environment's collective library, as data/{device}/{backend}/… names it.

    hccl: `v` and the CANN version (`v8.5`, the runtime's data/{device}/hccl/v8.5/); nccl: `nccl{v}_torch{t}_cuda{c}`; gloo: `torch{t}`
    (gloo ships inside torch). Only nccl and hccl import torch.
    """
    from opperf.versions import hccl_version_dir, installed_torch_version, running_stack

    check_backend(backend)
    if backend == "gloo":
        return f"torch{installed_torch_version()}"
    if backend == "hccl":
        return hccl_version_dir(running_stack("npu").runtime_version)
    import torch

    if not torch.cuda.is_available():
        raise OpperfError("the nccl version directory needs CUDA, and torch sees no CUDA device")
    nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return f"nccl{nccl}_torch{running_stack('cuda').torch}_cuda{torch.version.cuda}"


# What comm_version_dir gives on each back end, for a configured comm.version_dir (planned on another host).
COMM_VERSION_DIR_FORMS = {
    "gloo": (r"torch[0-9][0-9A-Za-z.+]*", "torch<t> (gloo ships inside torch), e.g. torch2.13.0"),
    "nccl": (r"nccl[0-9][0-9.]*_torch[0-9][0-9A-Za-z.+]*_cuda[0-9][0-9.]*",
             "nccl<v>_torch<t>_cuda<c>, e.g. nccl2.28.9_torch2.11.0_cuda13.0"),
    "hccl": (r"v[0-9][0-9A-Za-z.]*", "v<CANN version>, e.g. v8.5"),
}


def check_comm_version_dir(version_dir: str, backend: str) -> None:
    """A configured comm.version_dir is of the form comm_version_dir gives on `backend`."""
    import re

    check_backend(backend)
    pattern, form = COMM_VERSION_DIR_FORMS[backend]
    if not re.fullmatch(pattern, version_dir):
        raise OpperfError(f"{backend} version directory {version_dir!r} is not of the form {form}")


# --- a runnable, checkable case -----------------------------------------------------------------

def reduction_modulus(num_devices: int, dtype: CommDtype) -> int:
    """The pattern modulus m for reductions: values 0..m-1 summed over n ranks stay exactly representable."""
    modulus = min(16, dtype.largest_exact_integer // num_devices + 1)
    if modulus < 2:
        raise OpperfError(f"a sum over {num_devices} devices cannot be checked exactly in {dtype.torch_name} "
                          f"(largest exact integer {dtype.largest_exact_integer}); use a wider --dtype",
                          field="--dtype")
    return modulus


def _single_tensor_api(dist, op: str):
    """The one-tensor form of all_gather / reduce_scatter: `*_single` where torch has it (2.13 deprecates
    `*_into_tensor` / `*_tensor`), the older name otherwise."""
    old_name = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}[op]
    return getattr(dist, f"{op}_single", None) or getattr(dist, old_name)


GATHER_MODULUS = 101      # prime and < 127: distinct rank patterns, exact in every supported dtype
GATHER_RANK_STEP = 7      # rank j's pattern is shifted by 7*j, so chunks of different ranks differ


class CollectiveCase:
    """One (op, group, message size) on this rank: buffers, the call, the known pattern and its check.

    Rank j (its index in the group) fills its input from `(index + shift(j)) % m`; the expected output
    follows from the op's definition. The check compares every element exactly.
    """

    def __init__(self, op: str, message_bytes: int, dtype: CommDtype, group, group_ranks: list[int],
                 group_index: int, device: str):
        import torch

        self.op = op
        self.dtype = dtype
        self.torch_dtype = getattr(torch, dtype.torch_name)
        self.group = group
        self.num_devices = len(group_ranks)
        self.group_index = group_index
        self.device = device
        if message_bytes % dtype.element_bytes:
            raise OpperfError(f"message size {message_bytes} B is not a whole number of "
                              f"{dtype.torch_name} elements ({dtype.element_bytes} B each)", field="--bytes-grid")
        elements = message_bytes // dtype.element_bytes
        if op == "all_to_all":
            # n equal chunks: round down to a multiple of n and record the bytes actually sent.
            elements -= elements % self.num_devices
            if elements == 0:
                raise OpperfError(f"all_to_all over {self.num_devices} devices needs at least "
                                  f"{self.num_devices} elements; {message_bytes} B is too small", field="--bytes-grid")
        self.elements = elements
        self.message_bytes = elements * dtype.element_bytes
        n, count = self.num_devices, elements
        empty = lambda size: torch.empty(size, dtype=self.torch_dtype, device=device)  # noqa: E731
        if op == "all_reduce":
            self.input = self.output = empty(count)
        elif op == "all_gather":
            self.input, self.output = empty(count), empty(n * count)
        elif op == "reduce_scatter":
            self.input, self.output = empty(n * count), empty(count)
        elif op == "all_to_all":
            self.input, self.output = empty(count), empty(count)
        else:
            collective(op)

    def run(self) -> None:
        """One call of the collective (asynchronous on devices)."""
        import torch.distributed as dist

        if self.op == "all_reduce":
            dist.all_reduce(self.output, group=self.group)
        elif self.op == "all_gather":
            _single_tensor_api(dist, "all_gather")(self.output, self.input, group=self.group)
        elif self.op == "reduce_scatter":
            _single_tensor_api(dist, "reduce_scatter")(self.output, self.input, group=self.group)
        else:
            dist.all_to_all_single(self.output, self.input, group=self.group)

    # pattern: (index + shift) % modulus, built on the device in a wide integer type, then cast
    def _pattern(self, count: int, shift: int, modulus: int):
        import torch

        index_dtype = torch.int32 if count + shift < 2**31 else torch.int64
        values = torch.arange(count, dtype=index_dtype, device=self.device)
        values.add_(shift).remainder_(modulus)
        return values

    def _input_pattern(self, rank_index: int, start: int = 0, count: int | None = None):
        """Elements start..start+count of rank `rank_index`'s input (all of it by default), built alone:
        the expected output needs only a slice of each peer's input, not the whole of it."""
        length = self.num_devices * self.elements if self.op == "reduce_scatter" else self.elements
        if self.op in ("all_reduce", "reduce_scatter"):
            shift, modulus = rank_index, reduction_modulus(self.num_devices, self.dtype)
        else:
            shift, modulus = GATHER_RANK_STEP * rank_index, GATHER_MODULUS
        return self._pattern(length - start if count is None else count, shift + start, modulus)

    def fill(self) -> None:
        """Write this rank's known input, and poison an out-of-place output so unwritten elements show."""
        self.input.copy_(self._input_pattern(self.group_index))
        if self.output is not self.input:
            self.output.fill_(-1)

    def expected_output(self):
        import torch

        n, count, j = self.num_devices, self.elements, self.group_index
        if self.op in ("all_reduce", "reduce_scatter"):
            start = j * count if self.op == "reduce_scatter" else 0
            total = self._input_pattern(0, start, count)
            for k in range(1, n):
                total.add_(self._input_pattern(k, start, count))
            return total
        if self.op == "all_gather":
            return torch.cat([self._input_pattern(k) for k in range(n)])
        chunk = count // n     # all_to_all: my chunk k is rank k's chunk j
        return torch.cat([self._input_pattern(k, j * chunk, chunk) for k in range(n)])

    def check(self) -> str | None:
        """None when the output equals the op's definition on the known inputs, else what differs."""
        import torch

        expected = self.expected_output().to(self.torch_dtype)
        if torch.equal(self.output, expected):
            return None
        wrong = (self.output != expected).nonzero()
        first = int(wrong[0, 0])
        return (f"{self.op} over {self.num_devices} devices, {self.message_bytes} B {self.dtype.torch_name}, "
                f"group rank {self.group_index}: {len(wrong)} of {expected.numel()} elements wrong "
                f"(first at {first}: got {self.output[first].item()}, expected {expected[first].item()})")

    def release(self) -> None:
        self.input = self.output = None
