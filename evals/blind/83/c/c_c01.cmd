python c_c01.py --port 34231
