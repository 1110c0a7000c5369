python b_c03.py
