"""Learning from the user's own runs: parse Megatron-LM / torchtitan training logs, fit the
GPU's few efficiency knobs to their step times, and write / apply a calibration file."""
