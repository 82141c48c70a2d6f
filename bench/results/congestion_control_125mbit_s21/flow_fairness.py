import socket, sys, threading, time, json
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
mode = sys.argv[1]
if mode == "recv":  # recv ADDR PORT NCONN
    addr, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port)); ls.listen(64)
    print("ready", flush=True)
    res = []
    def rd(c, peer):
        t0 = None; tot = 0
        while True:
            b = c.recv(1 << 20)
            if not b: break
            if t0 is None: t0 = time.time()
            tot += len(b)
        res.append((peer, tot, time.time()))
    ths = []
    for _ in range(n):
        c, a = ls.accept(); t = threading.Thread(target=rd, args=(c, a[0])); t.start(); ths.append(t)
    for t in ths: t.join()
    print(json.dumps(res), flush=True)
else:  # send CC BYTES GO_AT ADDR:PORT...
    cc, nbytes, go = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    socks = []
    for d in sys.argv[5:]:
        a, p = d.split(":"); s = socket.socket()
        s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
        s.connect((a, int(p))); socks.append(s)
    buf = b"x" * (1 << 20)
    while time.time() < go: time.sleep(0.001)
    def wr(s):
        left = nbytes
        while left > 0:
            left -= s.send(buf[:min(left, len(buf))])
        s.close()
    ths = [threading.Thread(target=wr, args=(s,)) for s in socks]
    [t.start() for t in ths]; [t.join() for t in ths]
    print("start", go, flush=True)
