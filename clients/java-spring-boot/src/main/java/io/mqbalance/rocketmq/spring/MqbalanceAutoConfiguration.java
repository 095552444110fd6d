package io.mqbalance.rocketmq.spring;

import io.mqbalance.rocketmq.SidecarClient;
import io.mqbalance.rocketmq.SidecarPushConsumer;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.AccessChannel;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.spring.autoconfigure.RocketMQAutoConfiguration;
import org.apache.rocketmq.spring.autoconfigure.RocketMQProperties;
import org.apache.rocketmq.spring.support.DefaultRocketMQListenerContainer;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.util.StringUtils;

/**
 * The mqbalance sidecar for rocketmq-spring-boot-starter: every {@code @RocketMQMessageListener}
 * container takes its queues from the sidecar and hands them over on revocation
 * ({@link SidecarListenerContainerPostProcessor}, {@link SidecarListenerContainers}), and
 * {@code RocketMQTemplate} sends through a producer that asks the sidecar for its queues
 * ({@link SidecarRoutedProducer}). {@code mqbalance.enabled=false} switches all of it off.
 *
 * <p>Runs before rocketmq-spring's {@link RocketMQAutoConfiguration}: the producer bean here,
 * configured from the same {@code rocketmq.producer.*} properties as rocketmq-spring's own, takes
 * the place of that one ({@code @ConditionalOnMissingBean}); an application that defines its own
 * {@code DefaultMQProducer} bean keeps it.
 */
@AutoConfiguration(before = RocketMQAutoConfiguration.class)
@ConditionalOnClass({DefaultRocketMQListenerContainer.class, SidecarPushConsumer.class})
@ConditionalOnProperty(prefix = "mqbalance", name = "enabled", havingValue = "true", matchIfMissing = true)
@EnableConfigurationProperties({MqbalanceProperties.class, RocketMQProperties.class})
public class MqbalanceAutoConfiguration {

    /** The sidecar's API: {@code mqbalance.url}, else {@code $MQBALANCE_URL}, else 127.0.0.1:8081. */
    @Bean
    @ConditionalOnMissingBean
    public SidecarClient mqbalanceSidecarClient(MqbalanceProperties properties) {
        return StringUtils.hasText(properties.getUrl()) ? new SidecarClient(properties.getUrl().strip())
            : new SidecarClient();
    }

    @Bean(SidecarListenerContainers.BEAN_NAME)
    public SidecarListenerContainers mqbalanceSidecarListenerContainers(MqbalanceProperties properties,
        SidecarClient client) {
        return new SidecarListenerContainers(properties, client);
    }

    /** Static: a post-processor is made before the other beans, and asks for the registry only when used. */
    @Bean
    public static SidecarListenerContainerPostProcessor mqbalanceListenerContainerPostProcessor(
        ObjectProvider<SidecarListenerContainers> containers) {
        return new SidecarListenerContainerPostProcessor(containers);
    }

    /**
     * rocketmq-spring's {@code defaultMQProducer}, made the way its {@code RocketMQAutoConfiguration}
     * makes it (the same properties, ACL and trace settings), as a {@link SidecarRoutedProducer}.
     */
    @Bean(RocketMQAutoConfiguration.PRODUCER_BEAN_NAME)
    @ConditionalOnMissingBean(DefaultMQProducer.class)
    @ConditionalOnProperty(prefix = "rocketmq", value = {"name-server", "producer.group"})
    @ConditionalOnProperty(prefix = "mqbalance.producer", name = "enabled", havingValue = "true",
        matchIfMissing = true)
    public DefaultMQProducer defaultMQProducer(RocketMQProperties rocketMQ, MqbalanceProperties properties,
        SidecarClient client) {
        RocketMQProperties.Producer config = rocketMQ.getProducer();
        String ak = config.getAccessKey();
        String sk = config.getSecretKey();
        RPCHook hook = StringUtils.hasLength(ak) && StringUtils.hasLength(sk)
            ? new AclClientRPCHook(new SessionCredentials(ak, sk)) : null;
        SidecarRoutedProducer producer = new SidecarRoutedProducer(config.getGroup(), hook,
            config.isEnableMsgTrace(), config.getCustomizedTraceTopic(), client, properties.getProducer().getLine());
        if (hook != null) {
            producer.setVipChannelEnabled(false);
        }
        producer.setNamesrvAddr(rocketMQ.getNameServer());
        if (StringUtils.hasLength(rocketMQ.getAccessChannel())) {
            producer.setAccessChannel(AccessChannel.valueOf(rocketMQ.getAccessChannel()));
        }
        producer.setSendMsgTimeout(config.getSendMessageTimeout());
        producer.setRetryTimesWhenSendFailed(config.getRetryTimesWhenSendFailed());
        producer.setRetryTimesWhenSendAsyncFailed(config.getRetryTimesWhenSendAsyncFailed());
        producer.setMaxMessageSize(config.getMaxMessageSize());
        producer.setCompressMsgBodyOverHowmuch(config.getCompressMessageBodyThreshold());
        producer.setRetryAnotherBrokerWhenNotStoreOK(config.isRetryNextServer());
        producer.setUseTLS(config.isTlsEnable());
        if (StringUtils.hasText(config.getNamespace())) {
            producer.setNamespace(config.getNamespace());
        }
        if (StringUtils.hasText(config.getNamespaceV2())) {
            producer.setNamespaceV2(config.getNamespaceV2());
        }
        producer.setInstanceName(config.getInstanceName());
        return producer;
    }
}
