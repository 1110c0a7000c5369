deepspeed --num_gpus 2 --master_port 49211 c_b01.py
