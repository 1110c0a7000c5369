accelerate launch --num_processes 2 --main_process_port 34001 a_b01.py
