deepspeed --num_gpus 2 --master_addr 127.0.0.1 --master_port 49117 c_c01.py
