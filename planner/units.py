"""Unit constants and dtype sizes. Memory is reported in GiB (2**30 bytes, what torch and
nvidia-smi report); bandwidth in GB/s (1e9 bytes/s, what datasheets quote); FLOP/s in 1e12."""

KiB = 1024
MiB = 1024**2
GiB = 1024**3

GB = 1e9
TERA = 1e12

MS_PER_S = 1e3
US_PER_S = 1e6

DTYPE_BYTES = {
    "fp32": 4,
    "tf32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
}
