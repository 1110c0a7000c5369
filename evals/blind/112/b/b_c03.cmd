accelerate launch --cpu --num_processes 2 --main_process_port 49109 b_c03.py
