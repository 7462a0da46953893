// Contended throughput of Apache Curator's InterProcessMutex, for fencelock's benchmark
// (tests/src/bench_zk.rs): N sessions (one CuratorFramework, hence one ZooKeeper connection,
// each), each looping acquire + release on the same lock path in a thread of its own.
//
//   java -cp <classes>:<curator jars> CuratorBench <connect-string> <lock-path> <sessions> <seconds>
//
// Runs a warm-up (for the JIT) of a third of <seconds> (at most 2 s) uncounted, then counts
// acquisitions for <seconds> and prints "RATE <acquisitions per second> <count> <elapsed s>".
// Errors print "ERROR <message>" and exit 3.

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorBench {
    public static void main(String[] args) {
        if (args.length != 4) {
            System.err.println("usage: CuratorBench <connect-string> <lock-path> <sessions> <seconds>");
            System.exit(64);
        }
        try {
            run(args[0], args[1], Integer.parseInt(args[2]), Double.parseDouble(args[3]));
            System.exit(0);
        } catch (Exception e) {
            System.out.println("ERROR " + e);
            System.out.flush();
            System.exit(3);
        }
    }

    static void run(String connect, String path, int sessions, double seconds) throws Exception {
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < sessions; i++) {
            CuratorFramework c = CuratorFrameworkFactory.builder()
                    .connectString(connect)
                    .sessionTimeoutMs(10_000)
                    .connectionTimeoutMs(10_000)
                    .retryPolicy(new RetryNTimes(3, 200))
                    .build();
            c.start();
            if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
                throw new IllegalStateException("not connected to " + connect);
            }
            clients.add(c);
        }
        AtomicBoolean counting = new AtomicBoolean(false);
        AtomicBoolean stop = new AtomicBoolean(false);
        AtomicLong count = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework c : clients) {
            InterProcessMutex mutex = new InterProcessMutex(c, path);
            Thread t = new Thread(() -> {
                while (!stop.get()) {
                    try {
                        mutex.acquire();
                        mutex.release();
                        if (counting.get()) {
                            count.incrementAndGet();
                        }
                    } catch (Exception e) {
                        errors.incrementAndGet();
                    }
                }
            });
            t.start();
            threads.add(t);
        }
        long warmMs = (long) Math.min(2000.0, seconds * 1000.0 / 3.0);
        Thread.sleep(warmMs);
        long start = System.nanoTime();
        counting.set(true);
        Thread.sleep((long) (seconds * 1000.0));
        counting.set(false);
        long n = count.get();
        double elapsed = (System.nanoTime() - start) / 1e9;
        stop.set(true);
        for (Thread t : threads) {
            t.join(30_000);
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        if (errors.get() > 0) {
            System.err.println(errors.get() + " acquire/release errors");
        }
        System.out.println("RATE " + (n / elapsed) + " " + n + " " + elapsed);
        System.out.flush();
    }
}
