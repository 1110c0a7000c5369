torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49208 c_b03.py
