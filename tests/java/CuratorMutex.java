// Apache Curator's InterProcessMutex on a lock path, for fencelock's interoperability tests
// (tests/tests/zookeeper.rs, `mod curator`) and for running by hand (scripts/curator-interop.sh).
//
//   java -cp <classes>:<curator jars> CuratorMutex <connect-string> <lock-path> \
//        [--wait-secs N] [--hold-secs N] [--session-ms N]
//
// Connects, prints "STARTED", then acquires the mutex, waiting at most --wait-secs (default
// 60; it prints "TIMEOUT" and exits 2 if the lock was not granted by then). Once granted it
// prints "ACQUIRED <czxid> <node path>" and holds until it reads a line on stdin (or stdin is
// closed), or --hold-secs pass (default 60); then it releases and prints "RELEASED".
// Errors print "ERROR <message>" and exit 3.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.data.Stat;

public class CuratorMutex {
    /** InterProcessMutex, exposing the path of the node it holds. */
    static final class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework client, String path) {
            super(client, path);
        }

        String node() {
            return getLockPath();
        }
    }

    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) {
        if (args.length < 2) {
            System.err.println("usage: CuratorMutex <connect-string> <lock-path>"
                    + " [--wait-secs N] [--hold-secs N] [--session-ms N]");
            System.exit(64);
        }
        String connect = args[0];
        String path = args[1];
        long waitSecs = 60;
        long holdSecs = 60;
        int sessionMs = 10_000;
        for (int i = 2; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--wait-secs": waitSecs = Long.parseLong(args[i + 1]); break;
                case "--hold-secs": holdSecs = Long.parseLong(args[i + 1]); break;
                case "--session-ms": sessionMs = Integer.parseInt(args[i + 1]); break;
                default:
                    System.err.println("unknown option " + args[i]);
                    System.exit(64);
            }
        }
        try {
            System.exit(run(connect, path, waitSecs, holdSecs, sessionMs));
        } catch (Exception e) {
            say("ERROR " + e);
            System.exit(3);
        }
    }

    static int run(String connect, String path, long waitSecs, long holdSecs, int sessionMs)
            throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new RetryNTimes(3, 200))
                .build();
        client.start();
        try {
            if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
                say("ERROR not connected to " + connect + " within 30 s");
                return 3;
            }
            Mutex mutex = new Mutex(client, path);
            say("STARTED");
            if (!mutex.acquire(waitSecs, TimeUnit.SECONDS)) {
                say("TIMEOUT");
                return 2;
            }
            String node = mutex.node();
            Stat stat = client.checkExists().forPath(node);
            say("ACQUIRED " + (stat == null ? -1 : stat.getCzxid()) + " " + node);

            // Hold until a line (or EOF) on stdin, or the hold timeout.
            CountDownLatch done = new CountDownLatch(1);
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

            mutex.release();
            say("RELEASED");
            return 0;
        } finally {
            client.close();
        }
    }
}
