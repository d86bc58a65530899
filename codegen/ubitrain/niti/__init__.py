"""NITI's integer arithmetic in numpy: rounding (RoundShift, PstoShift), rescale sites,
float-to-int8 quantization and the integer softmax gradient. The rules every int8 kernel
follows bit for bit (lowering/niti_kernels.py prints them as C) and the reference the tests
compare the generated C with; numpy only, so every layer may use them."""
