accelerate launch --cpu --num_processes 2 --main_process_port 49105 b_b01.py
