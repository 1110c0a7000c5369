torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49122 b_b02_fixed.py
