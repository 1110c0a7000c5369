accelerate launch --multi_gpu --num_processes 2 --main_process_port 33003 a_b02.py
