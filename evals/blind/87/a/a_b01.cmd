accelerate launch --multi_gpu --num_processes 2 --main_process_port 39001 a_b01.py
