accelerate launch --cpu --num_processes 2 --main_process_port 49106 b_b01_fixed.py
