deepspeed --num_gpus 2 --master_port 49003 a_b02.py
