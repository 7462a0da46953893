// Apache Curator's other lock recipes on one path, for fencelock's interoperability tests
// (tests/tests/zookeeper_curator.rs): InterProcessReadWriteLock, InterProcessSemaphoreV2, a
// revocable InterProcessMutex, and Revoker.
//
//   java -cp <classes>:<curator jars> CuratorLock <connect-string> <path> <recipe> \
//        [--wait-secs N] [--hold-secs N]
//
// <recipe>: read | write (InterProcessReadWriteLock), semaphore:N (InterProcessSemaphoreV2
// with N leases), revocable (an InterProcessMutex made revocable: on a revocation request it
// prints "REVOKE_REQUESTED" and releases), revoke:<node path> (Revoker.attemptRevoke on that
// node, then prints "REVOKE_SENT" and exits).
//
// Connects, prints "STARTED", acquires waiting at most --wait-secs (default 60; else prints
// "TIMEOUT" and exits 2), prints "ACQUIRED <czxid> <node path>", holds until a line (or EOF)
// on stdin or --hold-secs (default 60), releases and prints "RELEASED". Errors print
// "ERROR <message>" and exit 3.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.Revoker;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.data.Stat;

public class CuratorLock {
    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** The node an InterProcessMutex (or a read or write lock) holds. */
    static String lockPath(InterProcessMutex m) throws Exception {
        Method getLockPath = InterProcessMutex.class.getDeclaredMethod("getLockPath");
        getLockPath.setAccessible(true);
        return (String) getLockPath.invoke(m);
    }

    public static void main(String[] args) {
        if (args.length < 3) {
            System.err.println("usage: CuratorLock <connect-string> <path> <recipe>"
                    + " [--wait-secs N] [--hold-secs N]");
            System.exit(64);
        }
        long waitSecs = 60;
        long holdSecs = 60;
        for (int i = 3; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--wait-secs": waitSecs = Long.parseLong(args[i + 1]); break;
                case "--hold-secs": holdSecs = Long.parseLong(args[i + 1]); break;
                default:
                    System.err.println("unknown option " + args[i]);
                    System.exit(64);
            }
        }
        try {
            System.exit(run(args[0], args[1], args[2], waitSecs, holdSecs));
        } catch (Exception e) {
            say("ERROR " + e);
            System.exit(3);
        }
    }

    static int run(String connect, String path, String recipe, long waitSecs, long holdSecs)
            throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new RetryNTimes(3, 200))
                .build();
        client.start();
        try {
            if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
                say("ERROR not connected to " + connect + " within 30 s");
                return 3;
            }
            if (recipe.startsWith("revoke:")) {
                Revoker.attemptRevoke(client, recipe.substring("revoke:".length()));
                say("REVOKE_SENT");
                return 0;
            }
            CountDownLatch done = new CountDownLatch(1);
            say("STARTED");
            String node;
            Runnable release;
            if (recipe.equals("read") || recipe.equals("write")) {
                InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
                InterProcessMutex m = recipe.equals("read") ? rw.readLock() : rw.writeLock();
                if (!m.acquire(waitSecs, TimeUnit.SECONDS)) {
                    say("TIMEOUT");
                    return 2;
                }
                node = lockPath(m);
                release = () -> {
                    try { m.release(); } catch (Exception e) { throw new RuntimeException(e); }
                };
            } else if (recipe.startsWith("semaphore:")) {
                int n = Integer.parseInt(recipe.substring("semaphore:".length()));
                InterProcessSemaphoreV2 sem = new InterProcessSemaphoreV2(client, path, n);
                Lease lease = sem.acquire(waitSecs, TimeUnit.SECONDS);
                if (lease == null) {
                    say("TIMEOUT");
                    return 2;
                }
                node = path + "/leases/" + lease.getNodeName();
                release = () -> {
                    try { lease.close(); } catch (Exception e) { throw new RuntimeException(e); }
                };
            } else if (recipe.equals("revocable")) {
                InterProcessMutex m = new InterProcessMutex(client, path);
                m.makeRevocable(lock -> {
                    say("REVOKE_REQUESTED");
                    done.countDown();
                });
                if (!m.acquire(waitSecs, TimeUnit.SECONDS)) {
                    say("TIMEOUT");
                    return 2;
                }
                node = lockPath(m);
                release = () -> {
                    try { m.release(); } catch (Exception e) { throw new RuntimeException(e); }
                };
            } else {
                say("ERROR unknown recipe " + recipe);
                return 3;
            }
            Stat stat = client.checkExists().forPath(node);
            say("ACQUIRED " + (stat == null ? -1 : stat.getCzxid()) + " " + node);

            Thread reader = new Thread(() -> {
                try {
                    new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))
                            .readLine();
                } catch (Exception ignored) {
                    // EOF or a closed stream: release as well.
                }
                done.countDown();
            });
            reader.setDaemon(true);
            reader.start();
            done.await(holdSecs, TimeUnit.SECONDS);
            release.run();
            say("RELEASED");
            return 0;
        } finally {
            client.close();
        }
    }
}
