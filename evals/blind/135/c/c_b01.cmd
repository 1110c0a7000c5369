torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49201 c_b01.py
