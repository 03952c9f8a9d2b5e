#!/usr/bin/env python3
"""Router memory per parked request (issue 4's benchmark: <= 16 KiB each, 1,024 parked).

    scripts/park-memory.py ROUTER_HOST ROUTER_PORT METRICS_ADDR ROUTER_PID ATESPACE/ACTOR N

Against a running system whose pool is full (e.g. `ate up --workers 1 --worker-slots 1` with one
actor running) and a suspended ACTOR: opens N connections that each send one request for it, so
each parks; samples the router's `atenet_router_parking_active` gauge and its VmRSS every 100 ms
for 4 s and prints the RSS delta at the most parked, per parked request; then waits for the
answers (the 503 capacity body after the budget) and counts them. Run it more than once: the
first run also pays the allocator's one-time growth; on a fresh router, the first run is the
figure issue 4 bounds (<= 16 KiB). Raises its own open-files limit to N + 64 if it can.
"""
import asyncio, resource, sys, re, time, urllib.request
router_host, router_port = sys.argv[1], int(sys.argv[2])
metrics = sys.argv[3]; pid = int(sys.argv[4]); target = sys.argv[5]; n = int(sys.argv[6])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 64:
    try: resource.setrlimit(resource.RLIMIT_NOFILE, (min(n + 64, hard), hard))
    except (ValueError, OSError): pass
def rss():
    for l in open(f'/proc/{pid}/status'):
        if l.startswith('VmRSS:'): return int(l.split()[1])
def parked():
    t = urllib.request.urlopen(f'http://{metrics}/metrics').read().decode()
    m = re.search(r'^atenet_router_parking_active(?:\{[^}]*\})? (\S+)', t, re.M)
    return float(m.group(1)) if m else None
async def one(i, results):
    r, w = await asyncio.open_connection(router_host, router_port)
    w.write(f'GET / HTTP/1.1\r\nHost: x\r\nate-target-actor: {target}\r\nConnection: close\r\n\r\n'.encode())
    await w.drain()
    data = await r.read()
    results.append(data.split(b'\r\n',1)[0])
    w.close()
async def main():
    base = rss(); print('rss before', base, 'KiB', 'parked', parked())
    results = []
    tasks = [asyncio.create_task(one(i, results)) for i in range(n)]
    best = 0; best_rss = base
    for _ in range(40):
        await asyncio.sleep(0.1)
        p = parked() or 0
        if p >= best:
            best = p; best_rss = rss()
    print('max parked', best, 'rss then', best_rss, 'KiB', 'delta', best_rss - base, 'KiB', 'per parked', round((best_rss-base)/max(best,1)*1024), 'bytes')
    await asyncio.gather(*tasks, return_exceptions=True)
    from collections import Counter
    print(Counter(results))
asyncio.run(main())
