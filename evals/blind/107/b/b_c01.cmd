python b_c01.py 49131
