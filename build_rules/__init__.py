"""Make-style incremental builds of Qualcomm QNN HTP context binaries, on doit.

checkpoint -> ONNX -> simplified ONNX -> (calibration, quantized model) -> per-chip context binary
-> emulator check -> manifest. See README.md for the stage graph and out/ layout.
"""
