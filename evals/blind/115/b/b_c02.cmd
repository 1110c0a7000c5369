python b_c02.py
