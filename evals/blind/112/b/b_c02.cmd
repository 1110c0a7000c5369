accelerate launch --cpu --num_processes 2 --main_process_port 49108 b_c02.py
