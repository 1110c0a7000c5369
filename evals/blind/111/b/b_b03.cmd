deepspeed --num_gpus 2 --master_port 49105 b_b03.py
