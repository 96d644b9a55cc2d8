package nacktracker.interop;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * The Java side of tests/test_java_interop.py: a retrying consumer of Apache Pulsar's own client.
 *
 * <p>Usage: RetryInterop SERVICE_URL TOPIC SUBSCRIPTION MAX_REDELIVER_COUNT DELAY_MS EXPECTED
 *
 * <p>Subscribes with enableRetry and a dead-letter policy (default retry and dead-letter topics),
 * prints READY, then receives EXPECTED messages (10 s each at most) and reconsumes each later by
 * DELAY_MS. Prints one line per message received: {@code GOT <data> <topic> <props>} (properties
 * sorted, k=v joined by ';'), then DONE.
 */
public final class RetryInterop {
  public static void main(String[] args) throws Exception {
    String url = args[0], topic = args[1], subscription = args[2];
    int maxRedeliver = Integer.parseInt(args[3]);
    long delayMs = Long.parseLong(args[4]);
    int expected = Integer.parseInt(args[5]);
    try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
      Consumer<byte[]> consumer = client.newConsumer()
          .topic(topic)
          .subscriptionName(subscription)
          .subscriptionType(SubscriptionType.Shared)
          .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
          .enableRetry(true)
          .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(maxRedeliver).build())
          .subscribe();
      System.out.println("READY");
      System.out.flush();
      for (int i = 0; i < expected; i++) {
        Message<byte[]> msg = consumer.receive(10, TimeUnit.SECONDS);
        if (msg == null) {
          break;
        }
        StringBuilder props = new StringBuilder();
        for (Map.Entry<String, String> e : new TreeMap<>(msg.getProperties()).entrySet()) {
          if (props.length() > 0) {
            props.append(';');
          }
          props.append(e.getKey()).append('=').append(e.getValue());
        }
        System.out.println("GOT " + new String(msg.getData()) + " " + msg.getTopicName() + " " + props);
        System.out.flush();
        consumer.reconsumeLater(msg, delayMs, TimeUnit.MILLISECONDS);
      }
      System.out.println("DONE");
      consumer.close();
    }
  }
}
