"""resnet8-sim: simulation throughput of the paper's ResNet8 set-up (benchmarks/bench_gpu.py)."""
