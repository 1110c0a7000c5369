deepspeed --num_gpus 2 --master_port 34103 b_b02.py
