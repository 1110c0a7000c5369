python c_b01.py
