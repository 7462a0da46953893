// Apache Curator's LeaderLatch on an election path, for fencelock's interoperability tests
// (tests/tests/zookeeper_curator.rs).
//
//   java -cp <classes>:<curator jars> CuratorLatch <connect-string> <latch-path> <id> \
//        [--wait-secs N] [--session-ms N]
//
// Connects, starts the latch, prints "STARTED <node path>" once its node exists, then waits to
// lead, at most --wait-secs (default 60; it prints "TIMEOUT" and exits 2). Once leader it prints
// "LEADER <czxid> <node path>" and leads until it reads a line on stdin (or stdin is closed);
// then it closes the latch and prints "CLOSED". Errors print "ERROR <message>" and exit 3.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.retry.RetryNTimes;
import org.apache.zookeeper.data.Stat;

public class CuratorLatch {
    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) {
        if (args.length < 3) {
            System.err.println("usage: CuratorLatch <connect-string> <latch-path> <id>"
                    + " [--wait-secs N] [--session-ms N]");
            System.exit(64);
        }
        long waitSecs = 60;
        int sessionMs = 10_000;
        for (int i = 3; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--wait-secs": waitSecs = Long.parseLong(args[i + 1]); break;
                case "--session-ms": sessionMs = Integer.parseInt(args[i + 1]); break;
                default:
                    System.err.println("unknown option " + args[i]);
                    System.exit(64);
            }
        }
        try {
            System.exit(run(args[0], args[1], args[2], waitSecs, sessionMs));
        } catch (Exception e) {
            say("ERROR " + e);
            System.exit(3);
        }
    }

    static int run(String connect, String path, String id, long waitSecs, int sessionMs)
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
            LeaderLatch latch = new LeaderLatch(client, path, id);
            latch.start();
            long started = System.nanoTime();
            while (latch.getOurPath() == null) {
                if (System.nanoTime() - started > TimeUnit.SECONDS.toNanos(30)) {
                    say("ERROR no latch node within 30 s");
                    return 3;
                }
                Thread.sleep(10);
            }
            say("STARTED " + latch.getOurPath());
            if (!latch.await(waitSecs, TimeUnit.SECONDS)) {
                say("TIMEOUT");
                latch.close();
                return 2;
            }
            String node = latch.getOurPath();
            Stat stat = client.checkExists().forPath(node);
            say("LEADER " + (stat == null ? -1 : stat.getCzxid()) + " " + node);
            try {
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))
                        .readLine();
            } catch (Exception ignored) {
                // EOF or a closed stream: close as well.
            }
            latch.close();
            say("CLOSED");
            return 0;
        } finally {
            client.close();
        }
    }
}
