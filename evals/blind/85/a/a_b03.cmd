accelerate launch --num_processes 2 --main_process_port 38403 a_b03.py
