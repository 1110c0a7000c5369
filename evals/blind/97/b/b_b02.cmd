python b_b02.py
