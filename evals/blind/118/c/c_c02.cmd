python c_c02.py
