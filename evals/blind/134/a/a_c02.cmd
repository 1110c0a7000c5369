deepspeed --num_gpus 2 --master_port 49012 a_c02.py
