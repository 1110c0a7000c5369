torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49206 c_b03_fixed.py
