python b_c01.py
