// Contended throughput of Apache Curator's lock recipes, for fencelock's benchmark
// (bench/src/): N sessions (one CuratorFramework, hence one ZooKeeper connection, each),
// each looping acquire + release on the same path in a thread of its own.
//
//   java -cp <classes>:<curator jars> CuratorBench <connect-string> <path> <sessions> <seconds> [recipe]
//
// [recipe]: mutex (InterProcessMutex, the default), rw (InterProcessReadWriteLock, nine reads
// for every write), semaphore:N (InterProcessSemaphoreV2 with N leases).
//
// Runs a warm-up (for the JIT) of a third of <seconds> (at most 2 s) uncounted, then counts
// acquisitions for <seconds> and prints "RATE <acquisitions per second> <count> <elapsed s>",
// then "TOTAL <acquisitions including the warm-up>". Errors print "ERROR <message>" and exit 3.

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorBench {
    public static void main(String[] args) {
        if (args.length != 4 && args.length != 5) {
            System.err.println("usage: CuratorBench <connect-string> <path> <sessions> <seconds> [recipe]");
            System.exit(64);
        }
        try {
            String recipe = args.length == 5 ? args[4] : "mutex";
            run(args[0], args[1], Integer.parseInt(args[2]), Double.parseDouble(args[3]), recipe);
            System.exit(0);
        } catch (Exception e) {
            System.out.println("ERROR " + e);
            System.out.flush();
            System.exit(3);
        }
    }

    /** One acquire + release of the recipe, turn by turn. */
    interface Step {
        void run(long turn) throws Exception;
    }

    static Step step(CuratorFramework c, String path, String recipe) {
        if (recipe.equals("rw")) {
            InterProcessReadWriteLock rw = new InterProcessReadWriteLock(c, path);
            return turn -> {
                InterProcessMutex m = turn % 10 == 0 ? rw.writeLock() : rw.readLock();
                m.acquire();
                m.release();
            };
        }
        if (recipe.startsWith("semaphore:")) {
            int n = Integer.parseInt(recipe.substring("semaphore:".length()));
            InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(c, path, n);
            return turn -> {
                Lease lease = sem.acquire();
                sem.returnLease(lease);
            };
        }
        InterProcessMutex mutex = new InterProcessMutex(c, path);
        return turn -> {
            mutex.acquire();
            mutex.release();
        };
    }

    static void run(String connect, String path, int sessions, double seconds, String recipe)
            throws Exception {
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
        AtomicLong total = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework c : clients) {
            Step step = step(c, path, recipe);
            Thread t = new Thread(() -> {
                long turn = 0;
                while (!stop.get()) {
                    try {
                        step.run(turn++);
                        total.incrementAndGet();
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
        System.out.println("TOTAL " + total.get());
        System.out.flush();
    }
}
