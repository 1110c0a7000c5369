python c_c03.py
