accelerate launch --num_processes 2 --main_process_port 49011 a_b01.py
