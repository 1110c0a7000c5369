accelerate launch --multi_gpu --num_processes 2 --main_process_port 33004 a_b02_fixed.py
