package nacktracker.interop;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * The Java side of bench/retry_precision.py: how close to its due time each reconsumeLater'd
 * message comes back, with Apache Pulsar's own client.
 *
 * <p>Usage: RetryBench SERVICE_URL TOPIC SUBSCRIPTION DELAYS_FILE (one delay in ms per line, one
 * message each). Publishes one message per delay (its data: the index), then, as each arrives, a
 * worker thread calls reconsumeLater(msg, delay) (due: the call's start + delay, on
 * System.nanoTime) while the receiving thread stamps each retry's arrival and acknowledges it.
 * Prints {@code ERR <index> <arrival - due, ms>} per retry, then DONE (or after 30 s without one).
 */
public final class RetryBench {
  public static void main(String[] args) throws Exception {
    String url = args[0], topic = args[1], subscription = args[2];
    List<String> lines = Files.readAllLines(Path.of(args[3]));
    int n = lines.size();
    long[] delays = new long[n];
    for (int i = 0; i < n; i++) {
      delays[i] = Long.parseLong(lines.get(i).trim());
    }
    AtomicLongArray due = new AtomicLongArray(n);
    try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
      Consumer<byte[]> consumer = client.newConsumer()
          .topic(topic)
          .subscriptionName(subscription)
          .subscriptionType(SubscriptionType.Shared)
          .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
          .enableRetry(true)
          .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(100).build())
          .subscribe();
      BlockingQueue<Message<byte[]>> work = new LinkedBlockingQueue<>();
      Thread worker = new Thread(() -> {
        try {
          while (true) {
            Message<byte[]> msg = work.take();
            int i = Integer.parseInt(new String(msg.getData()));
            due.set(i, System.nanoTime() + delays[i] * 1_000_000L);
            consumer.reconsumeLater(msg, delays[i], TimeUnit.MILLISECONDS);
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        } catch (Exception e) {
          e.printStackTrace();
        }
      });
      worker.setDaemon(true);
      worker.start();
      try (Producer<byte[]> producer = client.newProducer().topic(topic).enableBatching(false).create()) {
        for (int i = 0; i < n; i++) {
          producer.sendAsync(Integer.toString(i).getBytes());
        }
        producer.flush();
      }
      int back = 0;
      while (back < n) {
        Message<byte[]> msg = consumer.receive(30, TimeUnit.SECONDS);
        if (msg == null) {
          break;
        }
        long arrived = System.nanoTime();
        if (msg.getProperty("RECONSUMETIMES") == null) {
          work.put(msg);
          continue;
        }
        int i = Integer.parseInt(new String(msg.getData()));
        System.out.println("ERR " + i + " " + (arrived - due.get(i)) / 1e6);
        consumer.acknowledge(msg);
        back++;
      }
      System.out.println("DONE");
      consumer.close();
    }
  }
}
