deepspeed --num_gpus 2 --master_port 49131 b_b03.py
